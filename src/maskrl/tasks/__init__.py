"""Built-in tasks (docs/spec.md §5). Importing this package registers them in :data:`TASKS`."""
from maskrl.tasks.base import TASKS, DataError, Example, Task, default_data_dir, get_task
from maskrl.tasks import code, countdown, file_task, jsonschema_task, math, sudoku, wordmath  # noqa: F401  (registration)

__all__ = ["TASKS", "DataError", "Example", "Task", "default_data_dir", "get_task"]
