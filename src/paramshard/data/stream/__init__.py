"""Live event streams a job trains on until it is stopped (paramshard.data.stream.source).

source.py: the StreamSource protocol; directory.py (+ tail.py, directory_position.py): the embedded
default, a directory of growing files; kafka.py: a Kafka topic; open.py: ``open_stream(spec, rank,
world)``; reader.py: StreamReader, a stream as a trainer's batch loop whose position travels with
its checkpoints (exactly once); replay.py: the writer side, a table appended as a live stream.
"""
