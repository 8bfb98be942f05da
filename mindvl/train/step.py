"""The compiled train step: one graph per input shape."""
import mindspore as ms
from mindspore import nn, ops


class TrainStep(nn.Cell):
    """Forward, backward, clip and update in one graph; returns (total loss, loss parts).

    Stages: (1) loss and gradients, (2) global-norm clip, (3) optimizer update.
    """

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, grad_clip: float):
        super().__init__()
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.grad_fn = ops.value_and_grad(loss_net, None, optimizer.parameters, has_aux=True)

    def construct(self, *batch):
        (loss, parts), grads = self.grad_fn(*batch)  # (1)
        if self.grad_clip > 0:
            grads = ops.clip_by_global_norm(grads, self.grad_clip)  # (2)
        loss = ops.depend(loss, self.optimizer(grads))  # (3)
        return loss, parts
