"""Run the second-GPU test with the launch guard (argv[1] == "guard") or without it ("none")."""
import contextlib, sys
import pytest
import mta.launch
if sys.argv[1] == "none":
    mta.launch.on_device_of = lambda args: contextlib.nullcontext()
sys.exit(pytest.main(["-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests/test_api_contracts.py", "-k", "another_gpu", "-x"]))
