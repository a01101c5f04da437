#!/usr/bin/env python3
"""TensorFlow's own parameter-server training of the flagship CIFAR-10 CNN, as the peer of cohort's
parameter servers: 2 workers + 2 parameter servers on 127.0.0.1 by default, between-graph replication with
tf.compat.v1.train.replica_device_setter (the path of the SageMaker parameter-server sample), Adam at
batch 128 per worker on CIFAR-shaped inputs generated on the workers. --mode sync wraps Adam in
SyncReplicasOptimizer (all workers' gradients averaged per step), async applies each gradient on arrival.
The chief measures the cluster's training throughput by the global step and prints it:
    tensorflow-ps mode=sync workers=2 ps=2 images/s=X
Needs tensorflow-cpu (pip install tensorflow-cpu).
"""
import argparse
import os
import socket
import subprocess
import sys
import time


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def build_model(tf, images, labels):
    """The Keras CIFAR-10 CNN of cohort's nn::cifar10_cnn, written with v1 variables and tf.nn ops."""
    init = tf.compat.v1.glorot_uniform_initializer()
    x = images
    channels = 3
    layer = 0

    def conv(x, cin, cout, padding):
        nonlocal layer
        layer += 1
        w = tf.compat.v1.get_variable(f"conv{layer}/kernel", [3, 3, cin, cout], initializer=init)
        b = tf.compat.v1.get_variable(f"conv{layer}/bias", [cout], initializer=tf.compat.v1.zeros_initializer())
        x = tf.nn.conv2d(x, w, 1, padding) + b
        gamma = tf.compat.v1.get_variable(f"bn{layer}/gamma", [cout], initializer=tf.compat.v1.ones_initializer())
        beta = tf.compat.v1.get_variable(f"bn{layer}/beta", [cout], initializer=tf.compat.v1.zeros_initializer())
        mean_ = tf.compat.v1.get_variable(f"bn{layer}/moving_mean", [cout], trainable=False,
                                          initializer=tf.compat.v1.zeros_initializer())
        var_ = tf.compat.v1.get_variable(f"bn{layer}/moving_variance", [cout], trainable=False,
                                         initializer=tf.compat.v1.ones_initializer())
        mean, variance = tf.nn.moments(x, [0, 1, 2])
        updates = [mean_.assign(0.99 * mean_ + 0.01 * mean), var_.assign(0.99 * var_ + 0.01 * variance)]
        with tf.control_dependencies(updates):
            x = tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)
        return tf.nn.relu(x)

    for filters, rate in ((32, 0.2), (64, 0.3), (128, 0.4)):
        x = conv(x, channels, filters, "SAME")
        x = conv(x, filters, filters, "VALID")
        x = tf.nn.max_pool2d(x, 2, 2, "VALID")
        x = tf.nn.dropout(x, rate=rate)
        channels = filters
    x = tf.reshape(x, [-1, 2 * 2 * 128])
    w1 = tf.compat.v1.get_variable("dense/kernel", [512, 512], initializer=init)
    b1 = tf.compat.v1.get_variable("dense/bias", [512], initializer=tf.compat.v1.zeros_initializer())
    x = tf.nn.dropout(tf.nn.relu(tf.matmul(x, w1) + b1), rate=0.5)
    w2 = tf.compat.v1.get_variable("dense_1/kernel", [512, 10], initializer=init)
    b2 = tf.compat.v1.get_variable("dense_1/bias", [10], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(x, w2) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def run_task(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})
    threads = args.threads if args.role == "worker" else 1
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1)
    server = tf.distribute.Server(cluster, job_name=args.role, task_index=args.index, config=config)
    if args.role == "ps":
        server.join()
        return
    workers = len(args.worker_hosts.split(","))
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(worker_device=f"/job:worker/task:{args.index}", cluster=cluster)):
        images = tf.random.uniform([args.batch_size, 32, 32, 3])
        labels = tf.random.uniform([args.batch_size], maxval=10, dtype=tf.int32)
        loss = build_model(tf, images, labels)
        step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = tf.compat.v1.train.AdamOptimizer(1e-3)
        hooks = []
        if args.mode == "sync":
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=workers,
                                                                 total_num_replicas=workers)
            hooks.append(optimizer.make_session_run_hook(args.index == 0))
        train_op = optimizer.minimize(loss, global_step=step)
    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=args.index == 0, hooks=hooks,
                                                     config=config, save_checkpoint_secs=None,
                                                     save_summaries_steps=None, log_step_count_steps=0) as session:
        # The chief measures the cluster by the global step; the other workers train until they are stopped
        # (a SyncReplicasOptimizer worker blocks once the chief stops handing out tokens).
        while session.run(step) < args.warmup:
            session.run(train_op)
        first, start = session.run(step), time.perf_counter()
        while (last := session.run(step)) < first + args.steps:
            session.run(train_op)
        seconds = time.perf_counter() - start
        if args.index == 0:
            # A sync global step consumes every worker's batch; an async one a single worker's.
            per_step = args.batch_size * (workers if args.mode == "sync" else 1)
            print(f"global_steps={last - first} seconds={seconds:.3f} images/s={(last - first) * per_step / seconds:.1f}",
                  flush=True)
        else:
            while True:
                session.run(train_op)


def launch(args):
    try:
        import tensorflow  # noqa: F401  (fail early and clearly when missing)
    except ImportError:
        print("tensorflow: not installed (pip install tensorflow-cpu)", file=sys.stderr)
        sys.exit(3)
    ports = free_ports(args.workers + args.ps)
    ps_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[args.workers:])
    worker_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[:args.workers])
    common = [sys.executable, __file__, "--ps-hosts", ps_hosts, "--worker-hosts", worker_hosts, "--mode", args.mode,
              "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
              "--threads", str(args.threads)]
    servers = [subprocess.Popen(common + ["--role", "ps", "--index", str(i)]) for i in range(args.ps)]
    chief = subprocess.Popen(common + ["--role", "worker", "--index", "0"], stdout=subprocess.PIPE, text=True)
    others = [subprocess.Popen(common + ["--role", "worker", "--index", str(i)]) for i in range(1, args.workers)]
    try:
        output = chief.communicate(timeout=args.timeout)[0]
    finally:
        for p in servers + others + [chief]:
            p.kill()
    rates = [float(line.split("images/s=")[1]) for line in output.splitlines() if "images/s=" in line]
    if chief.returncode != 0 or not rates:
        print("tensorflow-ps: the chief worker failed", file=sys.stderr)
        sys.exit(1)
    print(f"tensorflow-ps mode={args.mode} workers={args.workers} ps={args.ps} images/s={rates[-1]:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--role", choices=["ps", "worker"])
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ps-hosts")
    parser.add_argument("--worker-hosts")
    args = parser.parse_args()
    if args.role:
        run_task(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
