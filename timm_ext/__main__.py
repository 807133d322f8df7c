"""``python -m timm_ext``: the same command line as the ``timm-ext`` console script."""
import sys

from timm_ext_cli import main

if __name__ == '__main__':
    sys.exit(main())
