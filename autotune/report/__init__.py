"""Reports: plots split into data functions and renderers (`plots`), and the report folder with
its tables (`write`)."""
