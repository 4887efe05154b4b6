"""What every table kernel class shares (seq_tables, cp_seg_tables, checkpoint_table,
checkpoint_index): its PTX symbol is its class name, and it runs every sequence of the call unless
it is a listed mode (listed_sequences.ListedMode)."""


class TableKernel:
    """Base of the table kernel classes: `listed` is the flag their kernels test under const_expr
    (False here; the listed modes set it)."""

    listed = False

    def __str__(self):
        """What the kernel's PTX symbol spells for this object (the DSL spells a kernel method's
        symbol from its object): the class name, the tables having no static configuration."""
        return type(self).__name__
