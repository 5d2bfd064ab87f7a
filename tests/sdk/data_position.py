"""A data position for the restore-check tests: the next batch's index, saved and loaded as a sampler's state."""


class Position:
    """Where the loop is in its data: the next batch's index."""

    def __init__(self):
        self.index = 0

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]
