"""What the build process and a capture process share: files and names both read or write.

Imports no torch at the top and nothing of the stages after config, so the builder and
the capture script's process both import it. Takes the environment names of
config/capture_env.py; gives the stats file a capture writes and the build reads
(stats.py), the imports record behind the capture cache's second key (imported.py), and
the world a capture runs in, by its environment (world.py).
"""
