"""The independent reader of rlx's TensorBoard event files (trainer/tests/tensorboard.rs): the official
`tensorboard` package reads them back and prints JSON on stdout.

    tensorboard_reader.py accumulate DIR   # {"file_version": .., "scalars": [[step, tag, value], ..]}
                                           # as TensorBoard's own EventAccumulator loads the run in DIR
    tensorboard_reader.py records FILE     # [{"wall_time", "step", "file_version", "values": [[tag, v]]}]
                                           # every record, each checksum verified (exit 1 on a bad one)
"""

import json
import sys

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New


def accumulate(directory):
    accumulator = EventAccumulator(directory, size_guidance={SCALARS: 0})
    accumulator.Reload()
    scalars = [
        [event.step, tag, event.value]
        for tag in accumulator.Tags()["scalars"]
        for event in accumulator.Scalars(tag)
    ]
    return {"file_version": accumulator.file_version, "scalars": scalars}


def records(path):
    reader = PyRecordReader_New(path.encode())
    events = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events
        event = event_pb2.Event.FromString(reader.record())
        events.append(
            {
                "wall_time": event.wall_time,
                "step": event.step,
                "file_version": event.file_version if event.HasField("file_version") else None,
                "values": [
                    [value.tag, value.simple_value]
                    for value in event.summary.value
                    if value.HasField("simple_value")
                ],
            }
        )


def main():
    mode, path = sys.argv[1:]
    read = {"accumulate": accumulate, "records": records}[mode]
    try:
        result = read(path)
    except errors.DataLossError as e:
        print(f"data loss: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
