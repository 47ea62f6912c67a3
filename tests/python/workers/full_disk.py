"""Worker for test_faults: one process trains STEPS steps with the JSONL sink writing to
PATH on a disk that fills up during the run (the test mounts a tiny tmpfs, or limits the
file size), then uninstall(); prints {"steps", "uninstall_s"} and exits 0, as the script
would without the analyzer.

Usage: full_disk.py PATH STEPS
"""

import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import relax_straggler  # noqa: E402
from test_install import config, make, train  # noqa: E402

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
model, opt = make()
analyzer = relax_straggler.install(model, opt, config=config(jsonl_path=sys.argv[1]))
losses = train(model, opt, analyzer, int(sys.argv[2]))
started = time.monotonic()
analyzer.uninstall()
print(json.dumps({"steps": len(losses), "uninstall_s": time.monotonic() - started}), flush=True)
