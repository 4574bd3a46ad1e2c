"""How tests/data/before-move was made: ringtrain at d066746 (main before issue 29 moved the modules), one process:
`python make.py` in an empty folder. A full file and a sharded folder (model, Adam, StepLR, extras), and the model
state they must load as."""
import torch, torch.nn as nn, torch.nn.functional as F
import ringtrain as rt

def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    ring = rt.Ring(seed=0)
    model, opt, sched = ring.setup(model, opt, sched)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    for epoch in ring.epochs(2):
        for x, y in ring.loader(data, batch_size=8, shuffle=True):
            ring.backward(F.cross_entropy(model(x), y))
            opt.step(); opt.zero_grad()
        sched.step()
    ring.save("full.pt", model=model, optimizer=opt, scheduler=sched, epoch=1, note="written before the move")
    ring.save("sharded", full=False, model=model, optimizer=opt, scheduler=sched, epoch=1, note="written before the move")
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, "expected_model.pt")
main()
