"""The start-up hook `gpuwise watch` puts first on a watched program's PYTHONPATH.

This folder is both a package (so that it is installed, and gpuwise.watch() can import the
recorder) and a sys.path entry of the watched program, where `sitecustomize` and the
`_gpuwise_watch_*` modules are imported as top-level modules.
"""
