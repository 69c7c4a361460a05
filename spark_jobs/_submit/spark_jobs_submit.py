"""The file ``spark-submit`` runs: ``spark-submit --master M .../_submit/spark_jobs_submit.py <command> [args]``.

It sits alone in a folder that is not a package: spark-submit puts the script's folder first on
``sys.path``, and ``spark_jobs/`` itself holds modules (``inspect``) that would shadow the
standard library's. It runs the same CLI as ``python -m spark_jobs``; the session the command builds picks up the
master and memory that spark-submit set. Used by ``plugins/spark_jobs_airflow``'s operator.
"""

from __future__ import annotations

import sys

from spark_jobs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
