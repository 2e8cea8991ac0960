import os, sys, torch
sys.path.insert(0, "bench")
from twin.check import run_seam_step, _load, ulps, _twin_from
from twin.parse import load_model
from twin.optim import make_optimizer, split_decay

seam = sys.argv[1]
for model in sys.argv[2:]:
    for layout in ("nhwc", "nchw"):
        runs = []
        for rep in range(2):
            tmp = f"/tmp/probe_{os.path.basename(model)}_{layout}_{rep}"
            os.makedirs(tmp, exist_ok=True)
            info = run_seam_step(seam, model, tmp, "tf32", "cuda", None, 0, layout)
            runs.append((_load(tmp + "/init.safetensors"), _load(tmp + "/after.safetensors")))
        init, after = runs[0]
        mp = load_model(model)
        twin = _twin_from(mp, "tf32", "seam", init, torch.device("cuda"))
        names = [n for n, _ in twin.named_seam_parameters()]
        nd = [n for n in names if not torch.equal(runs[0][1]["grad/" + n], runs[1][1]["grad/" + n])]
        print(f"== {model} {layout}: grads differ between two runs in {len(nd)} of {len(names)}: {nd[:6]}")
        params = {n: torch.nn.Parameter(init[n].double().clone()) for n in names}
        c = twin.model_file.optimizer
        groups = split_decay(((n, params[n]) for n in names), twin.decay_names.__contains__, c.weight_decay)
        opt, _ = make_optimizer(twin, steps_per_epoch=max(1, 60000 // info["batch"]), groups=groups, foreach=False)
        for n in names:
            params[n].grad = after["grad/" + n].double()
        opt.step()
        rows = []
        for n in names:
            e = ulps(params[n], after[n])
            exp_d = params[n].detach().cpu() - init[n].double()
            got_d = after[n].double() - init[n].double()
            bad = (exp_d - got_d).abs() > 1e-6 * (exp_d.abs().max() + 1e-30)
            ratio = (got_d[exp_d.abs() > 0.5 * exp_d.abs().max()] / exp_d[exp_d.abs() > 0.5 * exp_d.abs().max()])
            rows.append((e, n, float(bad.double().mean()), float(exp_d.abs().max()), float((exp_d - got_d).abs().max()),
                         float(ratio.median()) if ratio.numel() else 0.0, n in twin.decay_names))
        rows.sort(reverse=True)
        for r in rows[:8]:
            print("  ulps %.3g %-28s frac_bad %.3f max|exp upd| %.3g max|diff| %.3g median got/exp %.6f decay %s" % r)
