"""(Ran at 5d57a6a, before the copy was removed: the GPU run found these layouts exact without it.)
pytest plugin: run the MTA kernels without ``mta.launch.vector_rows``'s copy of odd 16-bit layouts, to see whether
unpadded tiles of 16 and 32 read element by element are exact on the GPU (the stride probe found only padded and
element-by-element together wrong).

    PYTHONPATH=.:notes/h100_remeasure_2026-11-23 python -m pytest -p no_vector_rows tests/test_conv.py -k odd_row
"""
import mta.conv

mta.conv.vector_rows = lambda x: x
