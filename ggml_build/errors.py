"""The one error the build raises: what is wrong, and what to do about it."""


class BuildError(Exception):
    def __init__(self, what: str, todo: str = ""):
        super().__init__(what)
        self.what = what
        self.todo = todo

    def __str__(self) -> str:
        return f"{self.what}; to fix: {self.todo}" if self.todo else self.what
