"""A plugin module that cannot be imported (its dependency is missing), for pathbench's tests:
the task it would provide must fail only when used, with an error naming this package."""

import pathbench_plugin_missing_dependency  # noqa: F401  (deliberately not installed)
