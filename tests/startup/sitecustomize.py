"""TEST ONLY: imported by Python at the start of every process the suite starts (tests/conftest.py
puts this folder on PYTHONPATH); it sets the garbage collector's thresholds (suite_gc.py)."""
import suite_gc

suite_gc.apply()
