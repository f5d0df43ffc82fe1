"""A plugin that imports a moved module by its old name, first thing in a fresh interpreter."""

import subprocess
import sys


def test_a_plugin_written_against_the_old_paths_registers_where_the_run_looks():
    # Arrange: a fresh interpreter, so that no module was imported before the plugin's imports
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from dfedrw.peer.models import MODEL_REGISTRY\n"
        "except DeprecationWarning as w:\n"
        "    print('warned:', w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from dfedrw.peer.models import MODEL_REGISTRY\n"
        "from dfedrw.peer.learning.models import MODEL_REGISTRY as NOW\n"
        "print('same registry:', MODEL_REGISTRY is NOW)\n"
    )

    # Act
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout

    # Assert
    assert "warned: module dfedrw.peer.models moved to dfedrw.peer.learning.models; import it from there" in out
    assert "same registry: True" in out
