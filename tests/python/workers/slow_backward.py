"""An autograd identity whose backward sleeps: backward time that only a backward timer
sees. Shared by test_module_stages and its multi-rank worker."""

import time

import torch


class SlowBackward(torch.autograd.Function):
    """SlowBackward.apply(x, seconds): x unchanged; its backward sleeps `seconds` (s)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None
