"""`python -m ggml_build ...`: build_ggml.py's command line, also from an installed package
(the wheel carries build_ggml as a module; builds go into the installed ggml_py/lib/)."""
import sys

from build_ggml import main

sys.exit(main())
