"""Reading the ``summary.csv`` timm's train.py appends one row to after every epoch."""
import csv
from pathlib import Path
from typing import Dict, List, Union

__all__ = ['read_summary']


def read_summary(path: Union[str, Path]) -> List[Dict[str, float]]:
    """train.py's summary.csv as a list of rows (one per finished epoch, every column a float); empty while
    the file is missing or a row is half written (train.py may be writing it now)."""
    try:
        with open(path, newline='') as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, ValueError, TypeError):
        return []
