"""CEL expressions an agent supplies: parsed to a tree, costed before they are
accepted, and evaluated within a budget. Free of I/O."""
