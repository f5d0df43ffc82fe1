"""The learning parts, with no networking: data sets (:mod:`.datasets`, one registry), data held
as tensors, partitions, local test sets and auxiliary subsets (:mod:`.data`), a data set stored
once per machine (:mod:`.datacache`), models (:mod:`.models`), local steps and one model's
evaluation (:mod:`.training`), and many models as rows of one matrix (:mod:`.model_matrix`)."""
