"""lm-eval ``process_results`` of the parity task: maskrl's own Sudoku grader on the completion."""
from maskrl.tasks import get_task

TASK = get_task("sudoku4x4", "{puzzle}=")


def process_results(doc, results):
    completion = results[0]
    prompt = TASK.prompt_template.format(puzzle=doc["Puzzle"])
    reward = TASK.reward([prompt], [completion], puzzle=[doc["Puzzle"]], solution=[doc["Solution"]])[0]
    return {"acc": float(TASK.is_correct(reward)), "cell_acc": float(reward)}
