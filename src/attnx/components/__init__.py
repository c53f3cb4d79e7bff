"""The paper's own components, each registered through the same hook third-party plugins use."""
