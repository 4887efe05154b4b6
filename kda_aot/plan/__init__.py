"""From a validated problem to a launch: the context-parallel split, the kernel choice, the workspace
layout, the program of kernel launches and the cached call plan, and the cross-GPU split."""
