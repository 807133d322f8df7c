#!/usr/bin/env bash
# The wheel lane's virtualenv, before the wheel exists: `bash .ci/lanes/floor_venv.sh DIR`.
# A fresh virtualenv at DIR with Python 3.10 (the lowest Python pyproject admits) and the floor of what pyproject
# admits: torch 2.4.1, torchvision 0.19.1, timm 1.0.23, plus pytest and pytest-xdist. wheel_floor.sh then installs
# the built wheel into it, as a user who has these installs timm-ext (pip keeps them: they are in range). .ci/run
# starts this at its beginning, beside the newest lane's install: each pip install keeps one core busy for about
# two minutes, and there are two cores.
set -euo pipefail
floor="$1"
python310="${TIMM_EXT_CI_PYTHON310:-}"
if [ -z "$python310" ]; then
  for candidate in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10.*/bin/python3.10 /usr/bin/python3.10; do
    if [ -x "$candidate" ]; then python310="$candidate"; fi
  done
fi
if [ -z "$python310" ]; then
  echo 'wheel lane: no Python 3.10 found (the lowest Python pyproject admits); set TIMM_EXT_CI_PYTHON310' >&2
  exit 1
fi
rm -rf "$floor"
"$python310" -m venv "$floor"
"$floor/bin/python" -m pip install --quiet --upgrade pip
"$floor/bin/python" -m pip install --quiet torch==2.4.1 torchvision==0.19.1 timm==1.0.23 pytest pytest-xdist
