# Types of the numbers of lsc_codes.h as _codes.pyx exports them.
CODES: dict[str, int]
NCODES: int
WIDTHS: dict[int, int]
EXP: dict[int, tuple[int, int]]
PRECISION: dict[str, int]
GROWTH_MODE: dict[str, int]
BACKOFF_MODE: dict[str, int]
MIN_ACTION: dict[str, int]
FLAGS: dict[str, int]
SKIP: int
APPLY: int
FLOOR_ERROR: int
DEVICE_FLAGS: dict[str, int]
NDEVICE_FLAGS: int
DEVICE_VALS: dict[str, int]
NDEVICE_VALS: int
OPTIM_FLAGS: dict[str, int]
NORM_FLAGS: dict[str, int]
META: dict[str, tuple[int, int]]
OPT_META: dict[str, tuple[int, int, int]]
