"""Line readers: one module per log format, each a pure function from the bytes of one line to `Fields`.

A reader knows its format and nothing of the lines around it: where a line names no step, the step placer
(sources/placer.py) gives it one. Each module shows its examples in its docstring; the suite runs them
(tests/unit/test_reader_examples.py). `text_log.TextLogParser` tries them in order: log dicts, DeepSpeed
`step=` lines, events, then `text_log.LINE_READERS`, then the generic reader.
"""
