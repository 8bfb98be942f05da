"""mindvl.parallel: declarative parallel strategies (parallel_configs/*.yaml): load, validate, apply to the
cells, plan memory, communication and step time."""
