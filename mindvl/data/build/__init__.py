"""Building a data set offline (`mindvl data build`): the sources (easyvqa.py, userdata.py, source.py),
spoken questions synthesised (speech.py), every item cleaned or quarantined (cleaning.py), the MindRecord
tables written (builder.py), the report and the dataset card (report.py, card.py), and an interrupted build
resumed unit by unit (units.py). It shares only the on-disk format (mindvl.data.records, root.py) with the
reading side (mindvl.data.reading)."""
