"""Training code as it is: the frameworks' own checkpoints become verified mado Checkpoints, and a resumed Run
hands them back (docs/integrations.md).

One module per framework, each imported on its own (``pip install 'mado-tracking[integrations]'``):

- ``mado_tracking.integrations.transformers``: a Hugging Face ``TrainerCallback``;
- ``mado_tracking.integrations.lightning``: a PyTorch Lightning ``Logger`` and callback;
- ``mado_tracking.integrations.accelerate``: ``save_state`` / ``load_state`` through mado.

Importing this package imports none of the frameworks.
"""
