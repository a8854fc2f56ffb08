"""A line the live guard says on stderr starts a line of its own, also while a tqdm bar (the Trainer's
progress bar) is drawn there without its newline (issue #24: `85.51it/s]lossguard: step 2 ...`)."""

import subprocess
import sys

JOB = r"""
import sys, time
from tqdm import tqdm
from lossguard.monitor.sinks import say
bar = tqdm(total=10, file=sys.stderr, mininterval=0, ascii=True)
for i in range(3):
    bar.update(1)
say("lossguard: step 2 rank 0: ERROR LOSS004 something")
bar.update(1)
bar.close()
say("lossguard: after the bar")
"""


def test_a_finding_line_is_never_glued_onto_a_progress_bar():
    proc = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.replace("\r", "\n").splitlines()
    said = [line for line in lines if "lossguard:" in line]
    assert said == ["lossguard: step 2 rank 0: ERROR LOSS004 something", "lossguard: after the bar"], lines


def test_without_tqdm_say_prints_a_plain_line():
    proc = subprocess.run([sys.executable, "-c", "from lossguard.monitor.sinks import say; say('lossguard: x')"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stderr == "lossguard: x\n"
