"""The jobs: each a pure transform plus ``run(spark, spec, ...)`` that reads and commits."""
