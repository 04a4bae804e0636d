"""The course's machinery: exercise checkers (:mod:`mta.course.exercises`), each chapter's figures
(``plots_0N``), and the find-the-block toy task (:mod:`mta.course.toy_task`), its model
(:mod:`mta.course.toy_model`) and its training runs (:mod:`mta.course.toy`, :mod:`mta.course.toy_train`).

It imports the library; the library never imports it, so ``import mta`` loads no plotting.
"""
