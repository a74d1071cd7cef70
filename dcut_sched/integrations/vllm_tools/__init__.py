"""Tools around the vLLM plugin (:mod:`dcut_sched.integrations.vllm`); vLLM never imports them.

- :mod:`.venv`: where the vLLM environment is and the settings vLLM runs with on CPU;
- :mod:`.checkpoint`: writes the project's SmolLM2 pair as Hugging Face folders vLLM loads;
- :mod:`.run`: the test and benchmark harness (runs vLLM with and without D-Cut on a job file);
- :mod:`.profile` and :mod:`.engine_steps`: ``dcut-profile --vllm`` (dummy batches, real engine steps).

Their commands are ``dcut_sched/cli/vllm_checkpoint.py``, ``vllm_run.py`` and ``vllm_profile.py``.
They import the plugin, never the other way round (no import circle inside ``integrations``:
``tests/integrations/test_import_graph.py``). Importable without vLLM; :mod:`.run`,
:mod:`.profile` and :class:`.engine_steps.StepTimer` need it when they run.
"""
