"""0049-few-row-squares: a sum of squares over a few rows (2 to 255 of a multiple of 512: the norms of a verify step's
or a batch step's rows) takes a block a row, its row read as float4 by 128 lanes (UNROLL 0 4, GROUP 0 128). Before, the
matvec rules took it: 4 rows a block, 32 lanes, 8 loads unrolled (the 8B's 8 rows of 4096 in 2 blocks of 16 serial
steps). Opts from a CUDA renderer constructed without a GPU; the numerics on tinygrad's CUDA-flavoured emulator against
numpy in float64 on fresh random rows. 0001-0048: the first test fails."""
import pytest
from test_0042_layouts_as_searched import run_rows

FEW = [["UNROLL", 0, 4], ["GROUP", 0, 128]]

@pytest.mark.parametrize("R,N", [(8, 4096), (4, 2048), (2, 512)])  # the 8B's verify8 norms, the 1B's 4-row batch step's
def test_few_rows_take_a_block_a_row(R, N):
  assert run_rows((R, N, "render"), {}) == FEW
  assert run_rows((R, N, "render"), {"FEW_ROW_SQUARES": "0"}) != FEW

@pytest.mark.parametrize("R,N", [(512, 2048), (8, 1000)])  # a chunk's rows (ROW_SQUARES), a row not of 512s
def test_other_sums_keep_their_layout(R, N):
  assert run_rows((R, N, "render"), {}) == run_rows((R, N, "render"), {"FEW_ROW_SQUARES": "0"})

def test_few_row_squares_are_the_sums():
  assert run_rows((4, 1024, "emulate"), {"DEV": "PYTHON"}) < 1e-6
