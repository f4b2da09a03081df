#!/usr/bin/env python3
"""Files a heaptrack profile's allocations under the part of a cluster they
belong to, for BENCHMARKS.md's memory-per-cluster table.

    heaptrack_print -f heaptrack.<name>.zst --flamegraph-cost-type peak \
        -F stacks.txt -p 0 -a 0 -T 0 -l 0
    hack/heap-by-part.py stacks.txt 1000     # 1000: the clusters in the run

Each stack is filed under the innermost frame that names a part (the rules
below, first match wins); a tokio channel's blocks are filed under whoever
owns the channel (kube's tower `Buffer`, or hyper). Prints KiB per cluster.
"""
import collections
import re
import sys

RULES = [
    (r"Secret.*Clone|secret\.\.Secret", "provider cache: the kubeconfig Secret"),
    (r"reflector..store|reflector::store|config_map..ConfigMap|Informer.*apply",
     "cache: the cluster's objects (objects, keys, map)"),
    (r"FramedWrite.*::new|framed_write..FramedWrite.*new", "h2 write buffer"),
    (r"hpack|huffman|FrameDecoder.*new", "h2 header decoding (HPACK)"),
    (r"LengthDelimited|h2..codec..framed_read|h2::codec::framed_read", "h2 read buffer"),
    (r"h2::proto|h2..proto|slab::", "h2 stream and connection state"),
    (r"ReadFrame.*default|kube_runtime..watcher|kube_runtime::watcher",
     "watch decoding (kube watcher's line buffer, stream state)"),
    (r"rustls|tokio_rustls|webpki|ring", "TLS (rustls configuration, connection, buffers)"),
    (r"bind_new_task|task::core::Cell", "tasks (futures of informer, sources, connection)"),
    (r"hyper_util|hyper_rustls|hyper::", "hyper client, connector and pool"),
    (r"serde_saphyr|kube_client..config|kube_client::config|ClientBuilder",
     "kubeconfig parsing and client building"),
    (r"controller::queue|controller..queue|controller::source|controller..source",
     "controller queue and sources"),
    (r"subscribe", "cache subscriptions"),
    (r"multicluster_runtime", "ours: cluster, cache maps, health record, watch stream"),
]
KUBE_CHANNEL = "kube client's request channel (tower Buffer)"
HYPER_CHANNEL = "hyper's request channel to the connection"


def channel_owner(frames):
    """Who owns the tokio channel a stack allocates a block of, if it does."""
    in_channel = False
    for frame in reversed(frames):
        if re.search(r"tokio::sync::mpsc|mpsc..(list|chan)", frame):
            in_channel = True
        elif in_channel:
            if re.search(r"tower..buffer|tower::buffer", frame):
                return KUBE_CHANNEL
            if "hyper" in frame:
                return HYPER_CHANNEL
            if "multicluster_runtime" in frame:
                return None
    return None


def part_of(frames):
    owner = channel_owner(frames)
    if owner:
        return owner
    for frame in reversed(frames):
        for pattern, name in RULES:
            if re.search(pattern, frame):
                return name
    return "other"


def main():
    path, clusters = sys.argv[1], int(sys.argv[2])
    totals = collections.Counter()
    with open(path) as stacks:
        for line in stacks:
            stack, cost = line.rstrip("\n").rsplit(" ", 1)
            totals[part_of(stack.split(";"))] += int(cost)
    for name, cost in totals.most_common():
        print(f"{cost / clusters / 1024:7.1f} KiB  {name}")
    print(f"{sum(totals.values()) / clusters / 1024:7.1f} KiB  total")


if __name__ == "__main__":
    main()
