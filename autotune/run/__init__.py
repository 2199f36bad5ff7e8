"""Running steps for real: measure the allocator's peak (`measure`), record what TensorFlow
executed (`profile`), run a tuned step against its prediction (`verify`) and check that its
swap-ins wait for their triggers (`gating`)."""
