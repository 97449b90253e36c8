CELLS: list[tuple[str, str]] = []
