"""Where an app above checkpoints (the worker) takes part in a checkpoint's life without checkpoints importing it
(ARCHITECTURE rule 7); the receiver is connected in the higher app's ``AppConfig.ready()``.

- ``direct_upload_declared(checkpoint_id)``: a direct-to-storage upload was
  completed and declared; sent on commit. The worker app's receiver enqueues
  the verification task that completes the checkpoint or records why not.
"""

from django.dispatch import Signal

direct_upload_declared = Signal()
