"""An algorithm placed in TFF: the blocks of a `tff.learning.templates.LearningProcess`
(`client_work`, `aggregation_factories`, `server_update`) built from the math layer's
rules, and their composition (`composer.compose`)."""
