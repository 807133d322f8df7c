"""Packaged train.py recipes: find them by name, check them against train.py, trace them to their papers.

* :mod:`~timm_ext.recipes.lookup`: list, find (by name or path) and read recipes;
* :mod:`~timm_ext.recipes.checks`: a recipe file's keys and values against train.py's own parser;
* :mod:`~timm_ext.recipes.paper_values`: the paper-values tables and a recipe's differences from its paper;
* :mod:`~timm_ext.recipes.index`: ``recipes/index.csv`` and the ``timm-ext recipes list`` table, as text.

The checks of a whole command line (recipe + arguments) are :mod:`timm_ext.launch.command_checks`'s.
"""
from timm_ext.recipes.checks import check_recipe, is_sam_optimizer
from timm_ext.recipes.index import (
    INDEX_COLUMNS,
    INDEX_MARKERS,
    LIST_COLUMNS,
    build_index,
    format_index,
    format_index_markdown,
    format_recipe_table,
    readme_with_index,
)
from timm_ext.recipes.lookup import RecipeError, close_recipe_names, find_recipe, list_recipes, load_recipe, recipes_dir
from timm_ext.recipes.paper_values import (
    PaperRow,
    check_against_paper,
    find_paper_row,
    load_paper_values,
    packaged_row,
    paper_values_dir,
)

__all__ = [
    'INDEX_COLUMNS', 'INDEX_MARKERS', 'LIST_COLUMNS', 'PaperRow', 'RecipeError', 'build_index', 'check_against_paper',
    'check_recipe', 'close_recipe_names', 'find_paper_row', 'find_recipe', 'format_index', 'format_index_markdown',
    'format_recipe_table', 'is_sam_optimizer', 'list_recipes', 'load_paper_values', 'load_recipe', 'packaged_row',
    'paper_values_dir', 'readme_with_index', 'recipes_dir',
]

