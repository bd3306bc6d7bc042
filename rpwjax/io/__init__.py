"""Files in and out, one module per job (import each name from the module that owns it):

* :mod:`rpwjax.io.source`: label files and input tables streamed in chunks
  (:class:`~rpwjax.io.source.TableSource`, :func:`~rpwjax.io.source.read_labels`),
  file kinds, encodings, progress bars;
* :mod:`rpwjax.io.csv_types`: typed CSV tables, each column's type from all of
  its values (:class:`~rpwjax.io.csv_types.TextColumnType`,
  :func:`~rpwjax.io.csv_types.read_csv_table`, :func:`~rpwjax.io.csv_types.csv_column_types`);
* :mod:`rpwjax.io.raw_csv`: a CSV's own bytes cut into pyarrow's rows
  (:class:`~rpwjax.io.raw_csv.RawCsvRows`), so CSV into CSV keeps every other field as it was;
* :mod:`rpwjax.io.writers`: CSV and Parquet writers and
  :func:`~rpwjax.io.writers.copy_with_labels`;
* :mod:`rpwjax.io.atomic`: outputs that appear whole or not at all
  (:func:`~rpwjax.io.atomic.atomic_outputs`), refused before any work when they
  would replace an input, a directory or a key file
  (:func:`~rpwjax.io.atomic.check_outputs`), and JSON files written that way.
"""
