"""tidelog.backends: storage backends selected by URI scheme (see tidelog.registry)."""
