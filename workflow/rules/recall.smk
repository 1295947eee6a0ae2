# The router recall screen (profile section `recall_screen`; focus.eval.router_screen, docs/routers.md).


if RECALL:

    rule recall_screen_cell:
        """One corpus and length of the screen: each router's distant attention mass kept at each budget beside the
        oracle's, and their perplexity where asked. A job each, so that a screen of hours resumes where it stopped
        and a cluster runs the cells side by side. No training: untrained routers are built here, `variant:NAME`
        routers are that variant's adapter."""
        conda:
            ENVIRONMENT
        input:
            tokens=lambda wildcards: tokens_file(RECALL["model"], wildcards.domain),
            train_tokens=tokens_file(RECALL["model"], P["train"]["domain"]),
            adapters=[f"{train_folder(RECALL['model'], spec.removeprefix('variant:'))}/adapter"
                      for spec in RECALL["routers"].values() if spec.startswith("variant:")],
        output:
            f"{R}/recall_screen/{{domain}}/{{length}}.json",
        wildcard_constraints:
            length=r"\d+",
        log:
            f"{R}/logs/recall_screen/{{domain}}/{{length}}.log",
        params:
            source=P["models"][RECALL["model"]]["source"],
            dtype=P["models"][RECALL["model"]]["dtype"],
            routers=recall_routers(),
            settings={"seq_len": P["train"]["seq_len"], "calibration_rows": P["train"].get("calibration_rows", 8),
                      "window": recall_window(),
                      **recall_settings("split", "rows", "shares", "keys", "last_queries", "ppl_shares", "ppl_keys",
                                        "ppl_rows", "ppl_routers", "ppl_tokens")},
        threads: 2
        resources:
            gpu=one_gpu_if_any(P["models"][RECALL["model"]]["eval_gpus"]),  # one process
        script:
            "../scripts/recall_screen_cell.py"


    rule recall_screen:
        """The screen's cells gathered: table, per-layer table, perplexity table and figures."""
        conda:
            ENVIRONMENT
        input:
            cells=expand(f"{R}/recall_screen/{{domain}}/{{length}}.json", domain=RECALL["domains"],
                         length=RECALL["lengths"]),
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
            settings={"window": recall_window(), **recall_settings("split", "rows", "last_queries", "ppl_shares",
                                                                   "ppl_keys", "ppl_routers")},
        threads: 1
        script:
            "../scripts/recall_screen.py"
