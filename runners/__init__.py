"""Everything above the tasks, models and kernels, by role:

- ``training``: a run's resolved configuration, the training loop, the optimizer, the record
  store, and executing a pack of runs;
- ``sweep``: grids and sweep files, the order packs train in, and the executors that train them;
- ``analysis``: records as a table, cells and the solved rule, tables, figures, attention maps;
- ``bench``: benchmarks that print tables, and the GPU check;
- ``cli``: the `pathbench` command, one thin module per command.

Commands import the library; the library never imports a command.
"""
