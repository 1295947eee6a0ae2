# The router recall screen (profile section `recall_screen`; focus.eval.router_screen, docs/routers.md).


if RECALL:

    rule recall_screen:
        """Each router's distant attention mass kept at each budget beside the oracle's: table, per-layer table and
        figure. No training: untrained routers are built here, `variant:NAME` routers are that variant's adapter."""
        conda:
            ENVIRONMENT
        input:
            tokens=[tokens_file(RECALL["model"], domain) for domain in RECALL["domains"]],
            train_tokens=tokens_file(RECALL["model"], P["train"]["domain"]),
            adapters=[f"{train_folder(RECALL['model'], spec.removeprefix('variant:'))}/adapter"
                      for spec in RECALL["routers"].values() if spec.startswith("variant:")],
        output:
            csv=report(TABLES["recall_screen"], caption="../report/recall_screen.rst", category="Routers"),
            md=TABLES["recall_screen"].replace(".csv", ".md"),
            layers=TABLES["recall_screen_layers"],
            provenance=TABLES["recall_screen"].replace(".csv", ".provenance.json"),
            figure=report(FIGURES["recall_screen"], caption="../report/recall_screen.rst", category="Routers"),
            figure_svg=FIGURES["recall_screen"].replace(".png", ".svg"),
            figure_layers=report(FIGURES["recall_screen_layers"], caption="../report/recall_screen.rst",
                                 category="Routers"),
            figure_layers_svg=FIGURES["recall_screen_layers"].replace(".png", ".svg"),
            **({"perplexity": TABLES["recall_screen_perplexity"]} if "recall_screen_perplexity" in TABLES else {}),
        log:
            f"{R}/logs/recall_screen.log",
        params:
            source=P["models"][RECALL["model"]]["source"],
            dtype=P["models"][RECALL["model"]]["dtype"],
            domains=RECALL["domains"],
            routers=recall_routers(),
            settings={"seq_len": P["train"]["seq_len"], "calibration_rows": P["train"].get("calibration_rows", 8),
                      "window": next(iter(P["models"][RECALL["model"]]["variants"].values()))["window"],
                      **{key: RECALL[key] for key in ("split", "lengths", "rows", "shares", "keys", "last_queries", "ppl_shares",
                                                "ppl_keys", "ppl_rows", "ppl_routers")}},
        threads: 2  # one long job, most of it alone after the trainings
        resources:
            gpu=one_gpu_if_any(P["models"][RECALL["model"]]["eval_gpus"]),  # one process
        script:
            "../scripts/recall_screen.py"
