"""Pictures of mindvl's results (matplotlib, PNG and SVG, no display needed).

Each module draws one kind of result from plain data (lists and dicts read from the files the commands write),
so the commands that produce the data stay free of matplotlib and the figures can be redrawn from the files.
"""
