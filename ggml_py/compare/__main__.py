"""``python -m ggml_py.compare A B`` (the same as ``python -m ggml_py compare A B``)."""
import sys

from . import main

sys.exit(main())
