"""Imported by a decoding server in a test: every interpreter forked from it aborts if it ever runs
its exit handlers, as one whose pyarrow thread pool is torn down while its threads still run
sometimes does ("terminate called without an active exception", SIGABRT)."""

import atexit
import os

atexit.register(os.abort)
