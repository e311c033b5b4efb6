"""The ``field`` command and what only it uses (its log lines and their redaction).

Importing this package, before anything imports NumPy, tells OpenBLAS (NumPy's BLAS in its
wheels) to let its threads sleep as soon as a product is done: by default they spin for
about 2^28 cycles after each one, waiting for more. The Field makes small products on
every write (the embedding of new units, the relevance calibration), and that spin took
a fifth of a core on 2 cores: durable RECORDs over HTTP cost 0.49-0.55 ms of CPU each
with it, 0.36-0.46 ms without (``benchmarks/README.md``, "Durable writes"). A large
product (matching 100,000 profiles) still runs on every core, as fast. An
``OPENBLAS_THREAD_TIMEOUT`` in the environment is kept.
"""

import os

#: OpenBLAS's threads spin 2^N cycles after a product (N from 4 to 30, its default 28)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
