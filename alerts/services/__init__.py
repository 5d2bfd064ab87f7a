"""The alerts app's state changes (docs/design/house.md#where-logic-goes)."""
