"""One ExplanationTrainer fit in a fresh process, for the tests that need one (``tests/test_explanation_trainer.py``).

    python tests/explanation_fit.py OUT.npz [--kill-at EPOCH:BATCH] [--backup DIR] [--replicas 2]

Trains a small digits MLP for three epochs of eight batches (cross-entropy plus the heatmap's
MSE to a frame pattern) and saves the student's final weights to OUT.npz. ``--backup`` adds
Keras's BackupAndRestore (a checkpoint at each epoch's end); ``--kill-at`` makes the process
SIGKILL itself after that batch of that epoch (a worker lost mid-epoch); ``--replicas 2``
trains under MirroredStrategy on two logical CPUs (set before TensorFlow's first op).
"""

from __future__ import annotations

import argparse
import os
import signal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-at", default=None)
    parser.add_argument("--backup", default=None)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()

    import tensorflow as tf

    if args.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    import keras
    import numpy as np

    from heatinv.data import load_digits
    from heatinv.keras import ExplanationTrainer
    from heatinv.targets import pattern_map

    digits = load_digits()
    x, y = digits.x_train[:256], digits.y_train[:256].astype("int32")
    # frames of another total per label: each replica's half of a batch has its own largest |target|
    targets = (pattern_map("frame", x.shape[1], width=x.shape[2])[None] * (1.0 + y[:, None, None, None])).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y, targets)).batch(32)
    strategy = tf.distribute.MirroredStrategy() if args.replicas > 1 else tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        student = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                                    keras.layers.Dense(10)])
        trainer = ExplanationTrainer(student, composite="epsilon_gamma_box")
        trainer.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        explanation_loss="mse", explanation_weight=10.0)
    callbacks = []
    if args.backup:
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup))
    if args.kill_at:
        epoch_to_kill, batch_to_kill = (int(v) for v in args.kill_at.split(":"))

        class Kill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if self.epoch == epoch_to_kill and batch == batch_to_kill:
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(Kill())
    history = trainer.fit(data, epochs=3, verbose=0, callbacks=callbacks)
    np.savez(args.out, *student.get_weights(), explanation_loss=np.array(history.history["explanation_loss"]))
    print(f"replicas {strategy.num_replicas_in_sync}, epochs run {len(history.history['loss'])}")


if __name__ == "__main__":
    main()
