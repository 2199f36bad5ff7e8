"""The `autotune` command line (`main`) and its shared options (`options`)."""
