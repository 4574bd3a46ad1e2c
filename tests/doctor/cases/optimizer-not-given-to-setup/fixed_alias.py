"""The same trainer, the optimizer handed to setup with the model."""
import torch
from ringtrain import Ring
from ringtrain import strategies as S


class Trainer:
    def __init__(self, model, lr=1e-3):
        self.ring = Ring(strategy=S.FSDP(reshard_after_forward=False))
        self.model = model.to(self.ring.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.model, self.optimizer = self.ring.setup(self.model, self.optimizer)

    def step(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.ring.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()
